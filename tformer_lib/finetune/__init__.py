"""微调（fine-tuning，第 17 章）：全量微调、LoRA（低秩适配）与 QLoRA，在一位诗人的诗上；内存账本；适配器文件与多适配器服务。

层次（只向下依赖）：lora（LoRALinear、apply_lora、merge_lora）→ qlora（量化底座 + LoRA）→ memory（字节公式）
→ poet（任务的数据）→ train（配方与训练）→ adapter_file（适配器文件）→ multi_lora（一批里多个适配器）→ measure
（``python -m tformer_lib.finetune.measure``：全量微调 vs LoRA r=4/16/64 vs QLoRA 的实测表）。
与 peft 的 ``get_peft_model`` / ``merge_and_unload`` 逐项对照（``tests/test_finetune_lora.py``）。
"""

from .lora import QUANTIZED_BASES, LoRALinear, apply_lora, lora_state_dict, merge_lora, trainable_parameters
from .qlora import QLORA_FORMATS, apply_qlora
from .memory import FINETUNE_METHODS, LORA_TARGETS, finetune_memory, lora_activation_bytes, lora_parameter_count
from .poet import poet_counts, poet_data, poet_documents
from .train import FINETUNE_RECIPE, finetune_poet, finetune_scores, prepare_finetune
from .adapter_file import ADAPTER_FORMAT, adapter_from_model, apply_adapter, load_adapter, quantize_base_for, save_adapter
from .multi_lora import AdapterSet, MultiLoRALinear

__all__ = [
    "LoRALinear", "apply_lora", "merge_lora", "lora_state_dict", "trainable_parameters", "QUANTIZED_BASES",
    "QLORA_FORMATS", "apply_qlora",
    "FINETUNE_METHODS", "LORA_TARGETS", "finetune_memory", "lora_activation_bytes", "lora_parameter_count",
    "poet_counts", "poet_data", "poet_documents",
    "FINETUNE_RECIPE", "finetune_poet", "finetune_scores", "prepare_finetune",
    "ADAPTER_FORMAT", "adapter_from_model", "apply_adapter", "load_adapter", "quantize_base_for", "save_adapter",
    "AdapterSet", "MultiLoRALinear",
]
