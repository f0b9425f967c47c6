"""Train the scenario's small models, with the lock's xgboost and scikit-learn.

    python train_models.py DIR

writes DIR/fraud/1 and DIR/fraud/2 (XGBoost boosters, binary classification, 8 features) and
DIR/churn/1 (a scikit-learn random forest, regression, 4 features), each with the registry's
metadata.json. The files in models/ next to this script were made with it; the environment
that trains must match the one that serves (requirements/mlstack.lock: xgboost-cpu,
scikit-learn, numpy, joblib), since joblib pickles are tied to the scikit-learn version.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import joblib
import numpy as np
import xgboost as xgb
from sklearn.ensemble import RandomForestRegressor


def write(version_dir: Path, meta: dict) -> None:
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "metadata.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def main(out: Path) -> None:
    rng = np.random.default_rng(11)
    x = rng.normal(size=(2000, 8)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] - x[:, 2] + rng.normal(scale=0.5, size=2000) > 0).astype(np.float32)
    features = [f"f{i}" for i in range(8)]
    for version, trees in (("1", 20), ("2", 40)):
        booster = xgb.train(
            {"objective": "binary:logistic", "max_depth": 4, "eta": 0.3, "nthread": 1, "seed": 11},
            xgb.DMatrix(x, label=y, feature_names=features),
            num_boost_round=trees,
        )
        d = out / "fraud" / version
        write(d, {"framework": "xgboost", "file": "model.ubj", "features": features, "task": "classification"})
        booster.save_model(str(d / "model.ubj"))

    xr = rng.normal(size=(1000, 4))
    yr = 2.0 * xr[:, 0] - xr[:, 1] + 0.1 * rng.normal(size=1000)
    forest = RandomForestRegressor(n_estimators=10, max_depth=5, random_state=11, n_jobs=1).fit(xr, yr)
    d = out / "churn" / "1"
    write(
        d, {"framework": "sklearn", "file": "model.joblib", "features": ["tenure", "spend", "calls", "age"], "task": "regression"}
    )
    joblib.dump(forest, d / "model.joblib")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
