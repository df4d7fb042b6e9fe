"""Tools over model folders and configs: parameter and sharding tables, ahead-of-time compilation, evaluation."""
