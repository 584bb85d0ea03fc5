"""The toy's config check: what needs the composed config, before any work."""


def check(conf, arch):
    if conf.steps is not None and conf.scenario.widgets > conf.steps:
        return (f"scenario.widgets={conf.scenario.widgets} is more than steps={conf.steps}: "
                "the toy makes one widget a step")
    return None
