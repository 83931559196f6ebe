import sys

from ec_connector.cli import main

sys.exit(main())
