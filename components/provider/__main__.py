"""Entry point of Corral's component provider plugin (PulumiPlugin.yaml in this folder)."""

from corral.components.provider import main

if __name__ == "__main__":
    main()
