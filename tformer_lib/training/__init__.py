"""训练：标签平滑损失、预热调度、训练器与检查点。"""

from .checkpoint import CheckpointError, load_checkpoint, load_model, save_checkpoint
from .loss import LabelSmoothingLoss, label_smoothing_loss
from .schedule import NoamLambda, make_optimizer, make_scheduler, noam_rate
from .trainer import History, Trainer, TrainingDivergedError, evaluate

__all__ = [
    "CheckpointError",
    "load_checkpoint",
    "load_model",
    "save_checkpoint",
    "LabelSmoothingLoss",
    "label_smoothing_loss",
    "NoamLambda",
    "make_optimizer",
    "make_scheduler",
    "noam_rate",
    "History",
    "Trainer",
    "TrainingDivergedError",
    "evaluate",
]
