import sys

from gpu_queue_scaler.cli import main

sys.exit(main())
