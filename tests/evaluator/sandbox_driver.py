"""`python sandbox_driver.py FILE[@unsafe] ...`: evaluate each file on the tiny contract in this fresh process
(what `tik check` does), one JSON report per line on stdout. A test starts it with the environment (a key) or
the temporary directory it wants, or kills it mid-evaluation."""

import json
import sys

from evaluator_fixtures import FIX, tiny

from tik_kernels.evaluator import evaluate

for arg in sys.argv[1:]:
    path, _, mode = arg.partition("@")
    rep = evaluate(tiny(), path, root_path=FIX / "tiny_root.py", device="cpu", timeout=60,
                   sandbox=False if mode == "unsafe" else None)
    print(json.dumps({"verified": rep.verified, "failure": rep.failure}), flush=True)
