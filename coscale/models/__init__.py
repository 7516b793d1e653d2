"""Models: loading and exporting policies (hub, folder, builtin:), the tiny character model, prompt formats."""
