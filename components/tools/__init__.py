"""What a user runs beside the components: plot runs' curves, list the templates."""
