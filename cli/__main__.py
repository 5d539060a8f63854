"""``python -m cli ...`` is ``agentr1 ...`` (e.g. under ``accelerate launch``)."""
import sys

from cli.main import main

sys.exit(main())
