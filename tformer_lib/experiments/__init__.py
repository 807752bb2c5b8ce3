"""书里的对比实验：训练若干个模型、量出结果、写进随包的结果文件（``tformer_lib/results/*.json``）。

每个实验是一个 ``python -m tformer_lib.experiments.<名字>`` 命令，结果文件里记着这条命令、机器、线程数与日期；
笔记本只读结果文件，不在书里重训。

- :mod:`.length_generalization`：第 2 章，正弦、可学习与不用位置编码的模型在训练长度之外（反转任务）；
- :mod:`.ablations`：第 4 章，去掉前馈网络之后玩具翻译任务还学不学得会；
- :mod:`.norm_placement`：第 7 章，Post-LN 与 Pre-LN，不预热与预热结束之后；
- :mod:`.modern_variants`：第 10 章，唐诗模型上逐项换入现代结构改动（RMSNorm、SwiGLU、RoPE、GQA 等）的训练、计时与参数；
- :mod:`.document_masking`：第 9 章，打包训练时只用因果掩码 vs 文档掩码（每首诗位置从 0 数、只看自己）；
- :mod:`.moe`：第 16 章，唐诗模型的稠密 FFN vs 同样激活参数的混合专家；
- :mod:`.long_context`：第 16 章，在 64 个词元上训练的 RoPE / ALiBi 模型读 128 与 256 个词元（PI、NTK-aware、YaRN，及在 256 上短暂微调）。
"""
