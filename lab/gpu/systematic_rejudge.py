"""A run's aggregate-check summary judged again under ``margin_of``, and as if every estimate were eps larger.

For results/kernels-systematic.md: the H200's clean runs were made under the first margin (1e-4); this
reads their group intervals (the sweep's JSON or the pytest junit XML's ``systematic`` property), which the
margin does not change, and says which groups the current margins detect, and, per family and
entrypoint, how many groups a planted error of eps would move past the margin (a prediction: a planted
run also adds its own rounding noise).

    python -m lab.gpu.systematic_rejudge clean-tier.xml clean-sweep.json      # from the checkout root
"""

import json
import sys
import xml.etree.ElementTree as ET

from moegate.kernels.systematic import margin_of


def load(path):
    if path.endswith(".xml"):
        for p in ET.parse(path).iter("property"):
            if p.get("name") == "systematic":
                return json.loads(p.get("value"))
    return json.load(open(path))["systematic"]


for path in sys.argv[1:]:
    s = load(path)
    det = [
        g
        for g in s["groups"]
        if g["interval"][0] > margin_of(g["family"]) or g["interval"][1] < -margin_of(g["family"])
    ]
    print(f"{path}: {len(s['groups'])} groups, {s['samples']} samples; detected under margin_of: {len(det)}")
    for g in det:
        print("   ", g["entrypoint"], g["placement"], g["family"], g["interval"])
    for fam in ("bfloat16", "float16", "float32", "wNa16-bfloat16", "wNa16-float16"):
        row = []
        for eps in (0.0005, 0.001, 0.002, 0.005):
            eps_ok = []
            for ep in ("legacy", "modular"):
                gs = [g for g in s["groups"] if g["family"] == fam and g["entrypoint"] == ep]
                hit = sum(g["interval"][0] + eps > margin_of(fam) for g in gs)
                eps_ok.append(f"{hit}/{len(gs)}")
            row.append(f"{eps:.2%}: " + " ".join(eps_ok))
        print(f"  {fam}: " + "; ".join(row))
