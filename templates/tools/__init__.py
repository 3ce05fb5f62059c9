"""The tools and environments the templates give models (``posttrain.templates.tools.<module>:<name>``)."""
