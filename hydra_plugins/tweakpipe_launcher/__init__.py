"""Hydra launcher plugin of tweakpipe (Hydra finds launchers only in the hydra_plugins namespace)."""
