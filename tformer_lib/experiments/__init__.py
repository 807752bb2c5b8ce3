"""书里的对比实验：训练若干个模型、量出结果、写进随包的结果文件（``tformer_lib/results/*.json``）。

每个实验是一个 ``python -m tformer_lib.experiments.<名字>`` 命令，结果文件里记着这条命令、机器、线程数与日期；
笔记本只读结果文件，不在书里重训。

- :mod:`.document_masking`：第 9 章，打包训练时只用因果掩码 vs 文档掩码（每首诗位置从 0 数、只看自己）；
- :mod:`.moe`：第 16 章，唐诗模型的稠密 FFN vs 同样激活参数的混合专家；
- :mod:`.long_context`：第 16 章，在 64 个词元上训练的 RoPE / ALiBi 模型读 128 与 256 个词元（PI、NTK-aware、YaRN，及在 256 上短暂微调）。
"""
