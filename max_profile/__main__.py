import sys

from max_profile.entry import main

sys.exit(main())
