"""翻译模型（第一、二部分）：2017 年的编码器–解码器 Transformer，在玩具中→英语法上训练与解码。

- :mod:`.config`：:class:`~tformer_lib.translation.config.TransformerConfig`，模型的超参数；
- :mod:`.model`：编码器、解码器、生成器与 :func:`~tformer_lib.translation.model.make_model`；
- :mod:`.decoding`：贪心、采样与束搜索解码，以及 ``translate``；
- :mod:`.pretrained`：随包的训练好的玩具模型（没有就现训并缓存）。

数据在 :mod:`tformer_lib.data`，训练循环在 :mod:`tformer_lib.training`，二者与这里同属一层。
层次：在模型部件（:mod:`tformer_lib.parts`）之上，语言模型（:mod:`tformer_lib.lm`）之下。
"""
