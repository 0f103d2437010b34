"""Problems as math: candidate graphs in, solver-neutral models out."""
