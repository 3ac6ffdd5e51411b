#!/usr/bin/env python3
"""Checks the example job and host files against the JSON Schemas in docs/schema/, with an
independent validator (the `jsonschema` package): the schemas an editor uses accept what
Sluice accepts, and refuse a file with a mistake."""
import glob
import json
import sys
import tomllib

import jsonschema

job = json.load(open("docs/schema/job-file.json"))
host = json.load(open("docs/schema/host-file.json"))
failed = 0
files = sorted(set(glob.glob("examples/**/*.toml", recursive=True)))
for path in files:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    schema = host if "source" not in data else job
    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError as e:
        failed += 1
        print(f"{path}: {e.message}", file=sys.stderr)
units = {"name": "x", "source": {"type": "generator", "records": 1},
         "operator": [{"name": "t", "plugin": "t.wasm"}], "sink": {"type": "stdout"},
         "checkpoint": {"interval": "10s"}, "runtime": {"buffer": "64KiB"}}
jsonschema.validate(units, job)
for bad in ({**units, "colour": "blue"}, {**units, "source": {"type": "pipe"}},
            {**units, "checkpoint": {"mode": "exactly-once"}}):
    try:
        jsonschema.validate(bad, job)
    except jsonschema.ValidationError:
        continue
    failed += 1
    print(f"the job file schema accepts a mistake: {bad}", file=sys.stderr)
print(f"{len(files) + 4 - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
