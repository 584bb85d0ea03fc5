"""The stand-in framework's worker backend: a loss that shrinks by a tenth per step."""

from fxtrack.frameworks.base import Backend


class FakeBackend(Backend):
    name = "fake"

    def version(self): return "0.1"
    def device_kind(self): return "cpu"
    def build(self, batch_size): self.loss = 10.0
    def param_count(self): return 1
    def loss_value(self, handle): return handle
    def device_tags(self): return {"flavour": self.spec.framework_settings["flavour"]}

    def train_step(self):
        self.loss *= 0.9
        return self.loss
