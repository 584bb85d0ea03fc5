"""A stand-in framework, added as a user adds one: this package (its declaration here, its
backend beside it) and its config, ``conf/framework/fake.yaml``, found through
$FXTRACK_CONFIG_DIR. No fxtrack file changes (docs/extending.md#adding-a-framework)."""

from fxtrack.frameworks.declaration import CompileRule, Framework, Setting

FRAMEWORK = Framework(
    name="fake", backend="fakefw.backend:FakeBackend", extra="fake", report_order=5,
    compile_rules=(CompileRule(False, "nothing to compile"),), compiled_tag="compiled",
    uncompiled_tag="eager",
    settings={"flavour": Setting("plain", ("plain", "spicy"), "how the fake tastes")},
    absent={"inference": "the fake has no forward pass"},
)
