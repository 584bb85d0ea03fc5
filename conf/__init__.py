"""fxtrack's Hydra configs, installed as the package ``fxtrack.conf`` (see setup.py): a wheel
carries them, so ``fxtrack`` runs from any directory. Only the YAML files matter here."""
