"""The verifiers tasksets the templates play (``environment: {verifiers: posttrain.templates.tasksets.<module>}``)."""
