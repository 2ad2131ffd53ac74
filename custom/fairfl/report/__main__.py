"""`python -m fairfl.report`: the same as `fairfl report`."""

import sys

from fairfl.report.command import main

sys.exit(main())
