"""Drives a Gradio 5 page the way a user does: by the labels on screen.

LLaMA-Factory gives its components no ``elem_id``; their labels come from its locales on page load.
So components are found by their visible label, and when a label exists in several tabs (``Dataset``
is on Train and on Evaluate) the one on the visible tab is used.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

T = TypeVar("T")

_BLOCK = "ancestor::div[contains(concat(' ', normalize-space(@class), ' '), ' block ')][1]"


def _xpath_literal(text: str) -> str:
    if '"' in text:
        raise ValueError(f"labels with double quotes are not supported: {text!r}")
    return f'"{text}"'


class GradioPage:
    def __init__(self, driver: WebDriver, url: str, timeout: float = 30.0) -> None:
        self.driver = driver
        self.timeout = timeout
        driver.get(url)
        self.block("Model name")  # labels appear once LLaMA-Factory's page-load update has run

    def wait_for(self, probe: Callable[[], T | None], what: str, timeout: float | None = None) -> T:
        """Polls ``probe`` until it returns something truthy; the failure names what was awaited."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                result = probe()
                if result:
                    return result
            except (StaleElementReferenceException, NoSuchElementException, LookupError) as err:  # re-rendering
                last_error = err
            time.sleep(0.25)
        raise TimeoutError(f"timed out after {timeout or self.timeout:.0f} s waiting for {what} ({last_error})")

    def visible(self, xpath: str) -> list[WebElement]:
        return [element for element in self.driver.find_elements(By.XPATH, xpath) if element.is_displayed()]

    def block(self, label: str) -> WebElement:
        """The visible component whose label reads ``label``."""
        xpath = f"//span[@data-testid='block-info' and normalize-space(.)={_xpath_literal(label)}]/{_BLOCK}"

        def find() -> WebElement | None:
            found = self.visible(xpath)
            if len(found) > 1:
                raise LookupError(f"{len(found)} visible components labelled {label!r}")
            return found[0] if found else None

        return self.wait_for(find, f"a component labelled {label!r}")

    def set_text(self, label: str, text: str) -> None:
        field = self.block(label).find_element(By.CSS_SELECTOR, "textarea, input[type=text]")
        self._replace(field, text)

    def text(self, label: str) -> str:
        return self.block(label).find_element(By.CSS_SELECTOR, "textarea, input").get_attribute("value")

    def set_number(self, label: str, value: float) -> None:
        """Sliders and number fields both take typed input in their number box."""
        self._replace(self.block(label).find_element(By.CSS_SELECTOR, "input[type=number]"), str(value))

    def _replace(self, field: WebElement, text: str) -> None:
        field.click()
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.DELETE, text)
        # Blur without moving focus on (a TAB would open the next dropdown): Gradio commits on blur.
        self.driver.execute_script("arguments[0].blur();", field)
        self.wait_for(lambda: field.get_attribute("value") == text, f"{text!r} in the field")

    def options(self, label: str, typed: str = "", keep_open: bool = False) -> list[str]:
        """The choices a dropdown offers after typing ``typed`` (opening it runs its ``focus`` handlers)."""
        field = self._dropdown_input(label)
        field.click()
        if typed:
            field.send_keys(Keys.CONTROL, "a")
            field.send_keys(Keys.DELETE, typed)
        options = self.wait_for(self._open_options, f"the options of {label!r}")
        names = [option.get_attribute("aria-label") for option in options]
        if not keep_open:
            field.send_keys(Keys.ESCAPE)
        return names

    def close_dropdown(self, label: str) -> None:
        self._dropdown_input(label).send_keys(Keys.ESCAPE)

    def choose(self, label: str, choice: str) -> None:
        field = self._dropdown_input(label)
        field.click()
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.DELETE, choice)

        def option() -> WebElement | None:
            return next((o for o in self._open_options() if o.get_attribute("aria-label") == choice), None)

        self.wait_for(option, f"option {choice!r} in {label!r}").click()
        self.wait_for(lambda: choice in self.chosen(label), f"{choice!r} chosen in {label!r}")

    def chosen(self, label: str) -> list[str]:
        """The selected value of a dropdown, or the tokens of a multiselect one."""
        block = self.block(label)
        tokens = [token.text.strip() for token in block.find_elements(By.CSS_SELECTOR, ".token > span")]
        value = block.find_element(By.CSS_SELECTOR, ".secondary-wrap input").get_attribute("value")
        return tokens or ([value] if value else [])

    def _dropdown_input(self, label: str) -> WebElement:
        return self.block(label).find_element(By.CSS_SELECTOR, ".secondary-wrap input")

    def _open_options(self) -> list[WebElement]:
        return self.visible("//ul[contains(@class, 'options')]/li[@data-testid='dropdown-option']")

    def click(self, button_text: str) -> None:
        xpath = f"//button[normalize-space(.)={_xpath_literal(button_text)}]"
        self.wait_for(lambda: self.visible(xpath), f"a button {button_text!r}")[0].click()

    def open_tab(self, name: str) -> None:
        xpath = f"//button[@role='tab' and normalize-space(.)={_xpath_literal(name)}]"
        self.wait_for(lambda: self.visible(xpath), f"the {name!r} tab")[0].click()

    def open_accordion(self, label: str) -> None:
        xpath = f"//button[contains(@class, 'label-wrap')][span[normalize-space(.)={_xpath_literal(label)}]]"
        self.wait_for(lambda: self.visible(xpath), f"the {label!r} section")[0].click()

    def visible_text_containing(self, needle: str) -> WebElement | None:
        """The innermost visible element whose text contains ``needle``, if any."""
        xpath = f"//*[contains(., {_xpath_literal(needle)}) and not(*[contains(., {_xpath_literal(needle)})])]"
        found = self.visible(xpath)
        return found[0] if found else None

    def field_containing(self, needle: str) -> WebElement | None:
        """A visible text box (read-only ones included, which keep their text in ``value``) holding ``needle``."""
        fields = self.visible("//textarea | //input[@type='text']")
        return next((field for field in fields if needle in (field.get_attribute("value") or "")), None)

    def screenshot(self, path: Path, around: WebElement | None = None) -> Path:
        """The viewport, scrolled so that ``around`` sits in the middle of it."""
        try:  # cosmetic: a toast may fade, or ``around`` be re-rendered, while we act on it
            for close in self.visible("//button[contains(@class, 'toast-close')]"):
                close.click()  # notifications of earlier steps would cover the page
            if around is not None:
                self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", around)
        except StaleElementReferenceException:
            pass
        time.sleep(0.5)  # let Gradio finish re-laying out (and toasts fade) before the capture
        path.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(path))
        return path
