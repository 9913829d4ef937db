"""The experiment's configuration: the pydantic schema (`schema`), the data sections
(`data`), the cross-field checks (`checks`), what every section shares (`base`) and the
`a.b=value` override language (`overrides`). Its public names are here."""

from raymtl.config.data import DataConfig, PartitionConfig, PublicConfig, TaskConfig
from raymtl.config.overrides import apply_override, with_values
from raymtl.config.schema import (
    AlgorithmConfig,
    ExperimentConfig,
    KillClients,
    KillHost,
    MetricsConfig,
    ModelConfig,
    OutputConfig,
    RuntimeConfig,
    TopologyConfig,
    dump_config,
    load_config,
    load_raw,
    parse_config,
)
from raymtl.errors import ConfigError

__all__ = [
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "ExperimentConfig",
    "KillClients",
    "KillHost",
    "MetricsConfig",
    "ModelConfig",
    "OutputConfig",
    "PartitionConfig",
    "PublicConfig",
    "RuntimeConfig",
    "TaskConfig",
    "TopologyConfig",
    "apply_override",
    "dump_config",
    "load_config",
    "load_raw",
    "parse_config",
    "with_values",
]
