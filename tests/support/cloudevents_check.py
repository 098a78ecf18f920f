"""Reads CloudEvents batches (JSON arrays, one per line of stdin, as a
collector received them) with the official `cloudevents` SDK, which
validates each event against the CloudEvents 1.0 spec, and prints one JSON
object per event: its attributes (the time as the SDK parsed it) and data.
Any event the SDK refuses makes the script fail with the SDK's error."""

import json
import sys

from cloudevents.core.formats.json import JSONFormat

out = []
for line in sys.stdin:
    if not line.strip():
        continue
    for element in json.loads(line):
        event = JSONFormat().read(None, json.dumps(element))
        out.append(
            {
                "specversion": event.get_specversion(),
                "id": event.get_id(),
                "source": event.get_source(),
                "type": event.get_type(),
                "subject": event.get_subject(),
                "time": event.get_time().isoformat(),
                "datacontenttype": event.get_datacontenttype(),
                "data": event.get_data(),
            }
        )
print(json.dumps(out))
