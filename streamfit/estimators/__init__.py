"""scikit-learn-style estimators over ONNX models."""

from streamfit.estimators.classifier import OnnxClassifier
from streamfit.estimators.regressor import OnnxRegressor

__all__ = ["OnnxRegressor", "OnnxClassifier"]
