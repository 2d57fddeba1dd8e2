"""Family loaders: one module per config family, each turning a config dict into layers."""
