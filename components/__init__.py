"""corral.components: Pulumi ComponentResources for Corral."""
