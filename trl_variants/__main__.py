"""``python -m trl_variants ...``: the ``trl-variants`` command line (:func:`trl_variants.cli.main`)."""

from .cli import main

if __name__ == "__main__":
    main()
