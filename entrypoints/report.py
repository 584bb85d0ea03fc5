"""MLproject entry point for ``fxtrack report``; arguments after ``--`` are split like a shell."""

from run import forward  # entrypoints/run.py, beside this script

if __name__ == "__main__":
    forward("report")
