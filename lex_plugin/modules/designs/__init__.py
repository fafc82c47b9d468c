"""Trained designs, one module each (the registry: :mod:`.registry`): those of attention, then those of the decoder's
input and positions (the sink token, DroPE). Importing this package registers them, in the order attention applies
them; a new design is one module here, imported below, and one test file."""

from .registry import (DESIGN_OPTIONS, DESIGNS, DesignOption, DesignSpec, LayerDesign, QueryContext, build_designs,
                       design_table, register_design, unregister_design)
from .qk_norm import QK_NORM, QKNorm
from .ssmax import SSMAX, SSMax
from .temperature_tuning import TEMPERATURE_TUNING, TemperatureTuning
from .learned_sinks import LEARNED_SINKS, LearnedSinks
from .gated_attention import ATTENTION_GATE, AttentionGate
from .differential_attention import DIFFERENTIAL_ATTENTION, DifferentialAttention
from .moba import MOBA, MoBA
from .landmark import LANDMARK, Landmark
from .forget_gate import FORGET_GATE, ForgetGate
from .sink_token import SINK_TOKEN, SinkToken
from .drope import DROPE, DroPE

__all__ = ["ATTENTION_GATE", "AttentionGate", "DESIGN_OPTIONS", "DIFFERENTIAL_ATTENTION", "DifferentialAttention", "DROPE", "DroPE", "FORGET_GATE", "ForgetGate", "LANDMARK", "Landmark", "SINK_TOKEN", "SinkToken", "DESIGNS", "DesignOption", "DesignSpec", "LEARNED_SINKS", "LayerDesign", "LearnedSinks", "MOBA", "MoBA",
           "QKNorm", "QK_NORM", "QueryContext", "SSMAX", "SSMax", "TEMPERATURE_TUNING", "TemperatureTuning",
           "build_designs", "design_table", "register_design", "unregister_design"]
