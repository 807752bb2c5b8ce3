"""模型部件（model parts）：第 1–4、8、10 章逐个搭起来的积木，编码器–解码器与语言模型都由它们拼成。

- :mod:`.masks`：填充掩码与因果掩码；
- :mod:`.embedding`：词元嵌入（乘以 √d_model）；
- :mod:`.positional`：正弦、可学习、RoPE 与 ALiBi 位置信息；:mod:`.rope_scaling`：RoPE 的上下文外推（PI、NTK-aware、YaRN）；
- :mod:`.relative_position`、:mod:`.recurrent`：第 2 章对照用的相对位置偏置与循环网络；
- :mod:`.attention`：缩放点积注意力与多头注意力；:mod:`.flash`：分块在线 softmax（FlashAttention 的思路）；
- :mod:`.kv_cache`：解码时的 K/V 缓存（KV cache）；
- :mod:`.feedforward`、:mod:`.norms`、:mod:`.layers`：前馈网络、LayerNorm/RMSNorm 与残差子层、编码器层、解码器层。

层次：最底层，只依赖彼此与包根的约定（``_checks``、``specials``、``temperature`` 等），不导入别的子包。
公开名字从包根导入即可（``from tformer_lib import MultiHeadAttention``）。
"""
