"""Hydra sweeper plugin of tweakpipe: every job of a sweep runs, whatever the others did."""
