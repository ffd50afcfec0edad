"""Hydra discovers this plugin in the ``hydra_plugins`` namespace of every installed package.

It appends nemo-throughput's config groups (the top-level ``conf/`` of the repository, shipped
as ``nemo_throughput/conf``) to every Hydra app's search path, so ``+callbacks=throughput``
composes in scripts that know nothing about this package, NeMo's among them.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class NemoThroughputSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="nemo-throughput", path="pkg://nemo_throughput.conf")
