"""Notebook 06 (quantization): its experiments, and one-line findings worded from their live numbers.

One module per section of the notebook:

- `workload`: the two fine-tuned models (the Linear-heavy ``tiny_vit`` and the profile's CNN), calibration
  batches, accuracy on the test images, QAT's fine-tune.
- `schemes` (section 1): one weight quantized four ways (symmetric or not, per tensor or per channel), its error.
- `methods` (section 2): every method of `labkit.techniques.quantization.METHODS` and QAT on both models: file
  size, CPU latency, GPU latency where there is a GPU, accuracy; the timing noise measured in the same run.
- `flows` (section 2): static int8 by FX graph mode (torch.ao, deprecated) and by PT2E (torchao): size, accuracy,
  the layers each stores in int8.
- `claims` (section 3): popular claims tested: file size, fp16's speed, fp16 with int8 dynamic.
- `sensitivity` (section 3.4): which layers to keep in float, on the validation split.
- `qat` (section 4): fine-tune then quantize against quantization-aware fine-tuning.
- `language` (section 5): int8 dynamic quantization of a fine-tuned language model: size, latency per token,
  exact match and perplexity, the output layer kept in float or not.
- `panel` (section 6): what the notebook's panel runs.

The mechanisms are in `labkit.techniques.quantization`; the explanations are in the notebook.
"""

from .claims import Stacking, fp16_finding, size_finding, stacking
from .flows import FLOWS, flows, flows_finding
from .language import (
    ALL_INT8,
    FP32,
    FP32_AGAIN,
    HEAD_FLOAT,
    LM_EVAL_ROWS,
    lm_quantization,
    lm_quantization_finding,
)
from .methods import (
    CPU_BATCH_BESIDE_GPU,
    TABLE_METHODS,
    accuracy_noise,
    api_finding,
    chart_metrics,
    compare,
    compare_finding,
    methods_columns,
    methods_table,
    own_size_numbers,
    speed_verdict,
    table_columns,
)
from .panel import QuantRun, panel_estimate, panel_run
from .qat import qat_finding, qat_vs_ptq
from .schemes import scheme_errors, scheme_finding
from .sensitivity import (
    KEEP_FLOAT_CHOICES,
    SIMULATED_BITS,
    SIMULATED_CHOICES,
    sensitivity,
    sensitivity_finding,
)
from .workload import (
    CALIBRATION_BATCHES,
    EVAL_IMAGES,
    QAT,
    VIT,
    calibration_batches,
    eval_accuracy,
    extra_steps,
    fine_tuned,
    library_versions,
    linear_share,
    qat_model,
    workloads,
)

__all__ = [
    "ALL_INT8", "FP32", "FP32_AGAIN", "HEAD_FLOAT", "LM_EVAL_ROWS", "lm_quantization", "lm_quantization_finding",
    "CALIBRATION_BATCHES", "CPU_BATCH_BESIDE_GPU", "EVAL_IMAGES", "FLOWS", "KEEP_FLOAT_CHOICES", "QAT",
    "SIMULATED_BITS", "SIMULATED_CHOICES", "TABLE_METHODS", "VIT", "QuantRun", "Stacking", "accuracy_noise",
    "api_finding", "calibration_batches", "chart_metrics", "compare", "compare_finding", "eval_accuracy",
    "extra_steps", "fine_tuned", "flows", "flows_finding", "fp16_finding", "library_versions", "linear_share",
    "methods_columns", "methods_table", "own_size_numbers", "panel_estimate", "panel_run", "qat_finding", "qat_model",
    "qat_vs_ptq", "scheme_errors", "scheme_finding", "sensitivity", "sensitivity_finding", "size_finding",
    "speed_verdict", "stacking", "table_columns", "workloads"
]
