#!/usr/bin/env bash
# Placeholder: replaced by the real tool installer (helm, promtool, SeaweedFS check).
exit 0
