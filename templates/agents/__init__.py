"""The agent programs the templates run (``agent: {function: posttrain.templates.agents.<module>:<name>}``)."""
