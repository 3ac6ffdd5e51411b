"""Tests import the SDK from this checkout (no install needed) and the example plugins
from plugins-python/."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "plugins-python"))
