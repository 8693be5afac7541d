"""SGLang integration: plugin registration, CPU bridges, the DSPARK_MOE worker."""
