"""``python -m trl_variants.cli ...`` (as ``accelerate launch -m trl_variants.cli presample ...`` runs it): the
``trl-variants`` command line, the same as ``python -m trl_variants``."""

from . import main

if __name__ == "__main__":
    main()
