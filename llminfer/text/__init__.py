"""Text in and out, no model needed: the tokenizers (tokenizer, wordpiece),
chat templates in their sandbox (chat, chat_sandbox), the reasoning and tool
call formats models write (reasoning, harmony, tools), JSON-schema grammars
(structured) and the JSON size limits (jsonlimits). Stands on llminfer.core."""
