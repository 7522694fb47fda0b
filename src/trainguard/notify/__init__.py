"""Notifiers: a finding reaches a person (webhook, Slack-compatible chat, e-mail, a command).

targets.py parses and masks where messages go, message.py says what they say, send.py delivers one,
notifier.py decides what is sent and sends it from threads of its own (docs/notify.md).
"""
