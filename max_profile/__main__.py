import sys

from max_profile.cli import main

sys.exit(main())
