"""训练：标签平滑损失、预热调度、训练器与检查点。"""

from .loss import LabelSmoothingLoss, label_smoothing_loss
from .schedule import NoamLambda, make_optimizer, make_scheduler, noam_rate

__all__ = [
    "LabelSmoothingLoss",
    "label_smoothing_loss",
    "NoamLambda",
    "make_optimizer",
    "make_scheduler",
    "noam_rate",
]
