"""The templates posttrain ships, installed as ``posttrain.templates``: ``<algorithm>/<name>.yaml`` (run by name,
``--spec sft/tiny``), the small data they train on (``data/``) and the tools and environments they give models
(``tools/``, imported as ``posttrain.templates.tools.<module>``). ``posttrain templates`` lists
and copies them."""
