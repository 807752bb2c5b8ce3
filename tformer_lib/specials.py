"""特殊词元（special tokens）：整本书只用这里的具名常量，不写魔法数字。"""

PAD = 0  #: 填充（padding）词元的 id
BOS = 1  #: 序列开始（beginning of sequence）词元的 id
EOS = 2  #: 序列结束（end of sequence）词元的 id
UNK = 3  #: 未登录词（unknown token）的 id

#: 按 id 顺序排列的特殊词元字符串：SPECIAL_TOKENS[PAD] == "<pad>"。
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
