"""The linear strategy run over Mitogen (the `mitogen` package, BSD-3-Clause): one Python
interpreter per host, kept for the whole playbook, that receives each module once, instead of
a new interpreter and a new copy of the module for every task. site.yml's tasks are many and
mostly quick, so the per-task start was most of a run's time.

ansible.cfg names this file's directory in `strategy_plugins`: Mitogen's own strategy
directory lies inside whichever environment installed it. Without Mitogen (an Ansible that
was not installed with `warren[ansible]`), plays run with Ansible's own linear strategy and
say so once.

Mitogen pins its processes to CPUs (ansible_mitogen.affinity), and what a task starts inherits
the pin: on a two-CPU host, every daemon a play started (kubelet, containerd, the API server,
every sandbox) ran on one CPU while the other idled. The pinning is switched off here, before
any of Mitogen's processes start, so what the plays start may use every CPU.
"""

from __future__ import annotations

from ansible.plugins.strategy.linear import StrategyModule as LinearStrategy
from ansible.utils.display import Display

try:
    import ansible_mitogen.affinity
    import ansible_mitogen.strategy
except ImportError:  # the fallback, named in the warning below
    Display().warning(
        "the mitogen package is missing, so plays run with Ansible's linear strategy (slower): "
        "install Warren's Ansible environment with pip install 'warren[ansible]'"
    )

    class StrategyModule(LinearStrategy):  # type: ignore[no-redef]
        pass

else:
    ansible_mitogen.affinity.policy = ansible_mitogen.affinity.Policy()  # assigns nothing

    class StrategyModule(ansible_mitogen.strategy.StrategyMixin, LinearStrategy):  # type: ignore[no-redef]
        pass
