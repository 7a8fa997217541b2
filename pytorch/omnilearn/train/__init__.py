"""Training: data, models, the BSP and ASP workers, metrics."""
