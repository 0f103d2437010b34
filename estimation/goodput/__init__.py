"""Pollux's goodput model: throughput by placement and batch, times statistical efficiency
from the gradient noise scale, with the batch chosen to maximise their product.

* :mod:`.measurements` reads what Pollux measured per application (step times by
  placement and per-GPU batch; gradient statistics per epoch and batch);
* :mod:`.throughput` fits Pollux's throughput model to the step times, or interpolates them;
* :mod:`.efficiency` is the statistical efficiency and the gradient statistics by progress;
* :mod:`.model` combines them: ``GoodputModel.goodput(job, gpus, nodes, progress)``.
"""

from apportion.estimation.goodput.efficiency import (
                                                     GradientNoise,
                                                     noise_scale,
                                                     statistical_efficiency,
)
from apportion.estimation.goodput.measurements import (
                                                     POLLUX_LIMITS,
                                                     AppLimits,
                                                     AppMeasurements,
                                                     pollux_root,
                                                     read_application,
                                                     read_applications,
)
from apportion.estimation.goodput.model import (
                                                     GoodputChoice,
                                                     GoodputModel,
                                                     application_work,
                                                     split_batch,
)
from apportion.estimation.goodput.throughput import (
                                                     PlacementTable,
                                                     TableThroughput,
                                                     ThroughputModel,
)

__all__ = ["POLLUX_LIMITS", "AppLimits", "AppMeasurements", "GoodputChoice", "GoodputModel",
           "GradientNoise", "PlacementTable", "TableThroughput", "ThroughputModel",
           "application_work", "noise_scale", "pollux_root", "read_application",
           "read_applications", "split_batch", "statistical_efficiency"]
