"""inferchain: layered offline (batch) inference.

OfflineInference -> Scheduler -> ExecutionEngine -> ModelWorker -> Backend, on ONNX Runtime
(CPU, CUDA and CANN execution providers) and Ascend pyACL. See README.md and docs/.
"""

from inferchain.config import ModelConfig, Recipe, import_recipe_module, load_recipe
from inferchain.core.request import Request, RequestState
from inferchain.errors import (
    BackendError,
    Closed,
    ConfigError,
    DependencyFailed,
    InferchainError,
    InvalidInput,
    InvalidTransition,
    LoadError,
    MissingDependency,
    OutputMismatch,
    QueueFull,
    RequestCancelled,
    RequestError,
    RequestTimeout,
    StateLost,
)
from inferchain.handover import DeviceTensor
from inferchain.metrics import Stats
from inferchain.offline import OfflineInference
from inferchain.pipeline import ImagePipeline, Pipeline, Process
from inferchain.sequence import LiveSequence, Stepper
from inferchain.shards import read_results, result_arrays
from inferchain.tensors import ModelInfo, TensorDesc

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "Closed",
    "ConfigError",
    "DependencyFailed",
    "DeviceTensor",
    "ImagePipeline",
    "InferchainError",
    "InvalidInput",
    "InvalidTransition",
    "LiveSequence",
    "LoadError",
    "MissingDependency",
    "ModelConfig",
    "ModelInfo",
    "OfflineInference",
    "OutputMismatch",
    "Pipeline",
    "Process",
    "QueueFull",
    "Recipe",
    "Request",
    "RequestCancelled",
    "RequestError",
    "RequestState",
    "RequestTimeout",
    "StateLost",
    "Stats",
    "Stepper",
    "TensorDesc",
    "__version__",
    "import_recipe_module",
    "load_recipe",
    "read_results",
    "result_arrays",
]
