"""The dataset side of streamio; see docs/design.md "Layout and the direction of dependencies"."""
