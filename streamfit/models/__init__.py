"""Ready-made online models: estimators that build their own ONNX graph from the data on the first fit."""

from streamfit.models.fm import FMClassifier, FMRegressor
from streamfit.models.linear import LinearRegressor
from streamfit.models.logistic import LogisticRegression
from streamfit.models.mlp import MLPClassifier, MLPRegressor
from streamfit.models.scaler import RunningScaler

__all__ = ["LinearRegressor", "LogisticRegression", "MLPRegressor", "MLPClassifier", "RunningScaler", "FMClassifier", "FMRegressor"]
