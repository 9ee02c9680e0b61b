#!/usr/bin/env python3
"""Makes a development CA and the certificates TensorLights' mutual TLS needs; see
tensorlights/devca.py (`scripts/dev_ca.py --help`)."""

import sys

from tensorlights.devca import main

if __name__ == "__main__":
    sys.exit(main())
