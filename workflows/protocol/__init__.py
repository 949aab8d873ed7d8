"""The vibey phase protocol as a workflow definition (``vibey-protocol`` v1).

The contract with the step handlers (step kinds, inputs, results, gates, names) is
docs/protocol.md. Modules:

* :mod:`~workflows.protocol.definition`: :data:`PROTOCOL`, ``decide`` and the step-failure gate;
* :mod:`~workflows.protocol.kinds`: its step kinds and gate kinds, each declared once;
* :mod:`~workflows.protocol.product` and :mod:`~workflows.protocol.deploy`: what each step's
  success and each gate's answer does, phase by phase;
* :mod:`~workflows.protocol.enter`: entering a phase or a round (names are made here);
* :mod:`~workflows.protocol.plan`: the primitives (schedule, open a gate, transition, finish);
* :mod:`~workflows.protocol.results`: reading step results;
* :mod:`~workflows.protocol.state`: :class:`ProtocolState` and its strict codec.
"""

from workflows.protocol.definition import (
    DEFINITIONS,
    NAME,
    PROTOCOL,
    VERSION,
    ProtocolDefinition,
    describe,
)
from workflows.protocol.kinds import GATE_KINDS, STEP_KINDS
from workflows.protocol.results import ResultError
from workflows.protocol.state import (
    Gate,
    Pending,
    ProtocolState,
    StateCodecError,
    decode_state,
    encode_state,
)

__all__ = [
    "DEFINITIONS",
    "GATE_KINDS",
    "NAME",
    "PROTOCOL",
    "STEP_KINDS",
    "VERSION",
    "Gate",
    "Pending",
    "ProtocolDefinition",
    "ProtocolState",
    "ResultError",
    "StateCodecError",
    "decode_state",
    "describe",
    "encode_state",
]
