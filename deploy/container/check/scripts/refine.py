"""C2 check script: echoes its --params-json text upper-cased, as JSON."""

import json
import sys

params = json.loads(sys.argv[sys.argv.index("--params-json") + 1])
print(json.dumps({"refined": params["text"].upper()}))
