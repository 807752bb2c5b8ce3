"""微调（fine-tuning）：LoRA（低秩适配）——冻结的线性层旁边一条可训练的低秩支路，合并与拆开（第 17 章）。

与 peft 的 ``get_peft_model`` / ``merge_and_unload`` 逐项对照（``tests/test_finetune_lora.py``）。
"""

from .lora import LoRALinear, apply_lora, lora_state_dict, merge_lora, trainable_parameters

__all__ = ["LoRALinear", "apply_lora", "merge_lora", "lora_state_dict", "trainable_parameters"]
